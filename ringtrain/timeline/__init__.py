"""Reads a ``RINGTRAIN_TIMELINE`` trace: per training step, how much exchange hides behind backprop.

Run ``python -m ringtrain.timeline TRACE.json`` (see ``__main__``). The reading and the
numbers (``trace``, ``steps``, ``report``) are pure; ``picture`` draws with matplotlib.
"""
