"""Quantizers (format x granularity), quantized linear modules and UAQ invariant scaling."""
