"""What was measured: the store of runs, statistics over repeats, the evidence a figure is judged
on, and diagnosis (Fig 7.1).
"""
