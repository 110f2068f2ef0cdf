"""What is asked: params files, the plan of engine configs x load points, load points, and SLO
specs.
"""
