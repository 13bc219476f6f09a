"""Exporters, one module per op family; each registers with
:func:`ember.onnx.export.registry.exporter` when imported."""
