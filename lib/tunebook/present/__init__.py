"""What a person reads: claims tables, rendered reports, the index and the overview of the
manual's claims, comparisons, the notebooks' workbook and the tuning panel.
"""
