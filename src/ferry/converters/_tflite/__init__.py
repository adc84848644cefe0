"""The TFLite reader's internals: flatbuffer parsing, op translators, quantization, sparsity.

``reader`` turns the flatbuffer into plain dataclasses (through the ``tflite`` schema package, pure
Python, no TensorFlow); ``builder`` holds the ONNX graph being written (values, constants, QDQ,
layout transposes); ``ops`` has one translator per TFLite builtin op; ``translate`` drives them
over subgraph 0 and collects every op it cannot translate before failing.
"""
