"""What a person reads: claims tables, rendered reports, the index, comparisons, the notebooks'
workbook and the tuning panel.
"""
