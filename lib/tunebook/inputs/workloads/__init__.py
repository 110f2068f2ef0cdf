"""Workloads from files: real traffic (traces, prompt sets) sent by vLLM's benchmark client.

- `formats`: the file formats users bring, each read and checked line by line (FORMATS).
- `replay`: the window, the length scaling and caps, and the file vLLM's client reads.
"""
