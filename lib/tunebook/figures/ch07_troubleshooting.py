"""Chapter 7 — troubleshooting: from a symptom to the page that fixes it (Fig 7.1)."""

from __future__ import annotations

from tunebook.figures.registry import FigureUnit, Needs, chapter, figure

CHAPTER = chapter(7, "Troubleshooting", None,
                  "From the symptom to one number or log line to the fix.")


@figure("7.1")
class SymptomToFix(FigureUnit):
    title = "From the symptom to the fix"
    needs = Needs(measured=False)
