"""Records: what ember saves and loads (module weights, optimizer state), and weight import.

A record is plain data: nested dicts (string keys), lists, strings, numbers,
booleans, ``None``, bytes and :class:`~ember.TensorData` leaves. Recorders turn
records into files or bytes at a chosen precision; importers read weight files
other tools wrote (safetensors, PyTorch) without running code from them.
"""
