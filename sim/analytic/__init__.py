"""The analytic twin: closed forms for memory, communication, compute and offload.

Pure functions, numbers in and numbers out. Nothing here imports simpy (a test
enforces it), so the twin can check the discrete-event simulator independently.
"""
