"""What is served: model presets and their sizes, real weights from a GGUF, prompt sets, and layout
sizing (Fig 6.1).
"""
