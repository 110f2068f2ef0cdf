"""Altair charts of result frames and of the manual's reference data.
"""
