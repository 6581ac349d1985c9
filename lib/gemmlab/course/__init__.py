"""The course machinery: what turns the library into notebooks a reader runs.

:mod:`.notebook` (each chapter's first cell: cells for a GPU this machine lacks print one line; the tier
markers), :mod:`.runner` (``python -m gemmlab.course.runner``: every notebook headless, a table of what ran),
:mod:`.show` (library source rendered into a notebook, whole or in regions) and :mod:`.exercises` (each
chapter's checkers and worked solutions). Nothing below this package imports it.
"""
