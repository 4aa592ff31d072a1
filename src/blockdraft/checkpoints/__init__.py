"""The one place that knows foreign spellings: config keys, tensor names, file layouts."""
