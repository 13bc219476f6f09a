"""ONNX op converters, one module per op family.

Every module in this package is imported when the registry is first used, so a new
family is a new file here: nothing else needs to list it. A converter is a function
registered with :func:`ember.onnx.registry.converter`; see ``elementwise.py`` for the
simplest ones.
"""
