"""Reading and writing the files the qlinear command handles: NumPy .npy/.npz, safetensors, ONNX.

Nothing here imports onnx at module import time; the ONNX path imports it when an .onnx file is
given and says how to install it when it is missing.
"""
