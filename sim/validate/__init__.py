"""Validation: the functional ZeRO executor (numpy) and real torch.distributed runs on CPU.

torch is imported lazily inside the modules that need it, so `import sim` never needs it.
"""
