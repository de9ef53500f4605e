"""Model importers (ONNX: onnx_import)."""
