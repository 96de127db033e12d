"""The real-model corpus: trained ONNX models shipped inside PyPI wheels (rapidocr_onnxruntime, silero-vad),
the labelled data to run them on (made here, deterministically) and their task metrics.

- ``models``: where the model files are, a skip helper for tests, and ``ort_runner`` (an onnxruntime CPU
  session behind the ``run(feeds) -> outputs`` callable every task function takes).
- ``ocr``: rendered text lines and pages for the PP-OCR recogniser, direction classifier and detector.
- ``speech``: espeak-ng speech with silences for the silero voice activity detector.
- ``measure_float``: prints the float models' figures and timings
  (``uv run python -m tests.corpus.measure_float``).

The packages' own Python code is never imported (it needs opencv / torch): the pre- and post-processing is
re-implemented in NumPy + Pillow, following rapidocr_onnxruntime 1.4.4 and silero-vad 6.2.3.
"""
