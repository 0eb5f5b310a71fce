"""Calibration tables shipped with gaac-hf, installed as the package data ``gaac_hf.calibration_data``.

Find them by name with :func:`gaac_hf.calibration.find_table` (``calibration="smollm2-135m"``).
"""
