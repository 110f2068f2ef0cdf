"""Searching: the adaptive SLO search over engine knobs and users (adaptive), and `tunebook
tune` driving it on real engines, each point an ordinary stored run (tune).
"""
