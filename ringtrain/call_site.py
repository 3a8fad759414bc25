"""Where the user's code called ringtrain: what names an unnamed collective.

``user_call_site`` gives ``file.py:line`` of the innermost frame outside the ringtrain package.
Only the file's base name is kept, so that ranks that run the same script from different
directories still agree.
"""

import os
import sys

# Frames in files under this prefix are ringtrain's own. Its modules were all imported the
# same way, so their code's file names share the prefix that this one's ``__file__`` has.
_PACKAGE_PREFIX = os.path.dirname(__file__) + os.sep


def user_call_site() -> str:
    """Return ``file.py:line`` of the innermost caller outside ringtrain (``?`` if none)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_PREFIX):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
