"""The native data path both protocol adapters hand plain requests to: the lanes (``lanes.py`` over the
``_native_lanes`` extension module, built from this folder's C++ headers without any protocol library)."""
