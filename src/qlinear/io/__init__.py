"""The `qlinear quantize` and `qlinear dequantize` commands, as a one-way pipeline:

    commands      the command line, read once into plan.Settings
    pipeline      per format: read -> select -> calibrate -> quantize -> write -> report
    formats/      the adapters that read and write: tensor files, zarr stores, ONNX models
                  (onnx_weights: where a model's weights are and how its operators read them)
    select        which tensors are quantized and how (the expert defaults), or why they are kept
    calibration   scale and zero point from a weight's ranges, chunk by chunk
    quantization  the weight quantized chunk by chunk, with the error figures
    streaming     the same two stages through dask, for tensors larger than memory
    evaluation    running ONNX models: task figures on labelled data, the opset conversion check
    report        the table, the JSON and the plots
    plan          the values that flow between the stages; storage, chunks, atomic, extras, errors

Nothing here imports onnx at module import time; the ONNX path imports it when an .onnx file is
given and says how to install it when it is missing.
"""
