"""The rule that keeps the small chunk across hosts only where its trial was clearly faster."""

import pytest

from ringtrain.transport.link_chunk import MARGIN, small_is_faster


@pytest.mark.parametrize(
    ("setting_time", "small_time", "small"),
    [
        (10.0, 9.0, True),  # 10% faster
        (10.0, 10.0 * (1 - MARGIN) - 1e-9, True),  # just past the margin
        (10.0, 10.0 * (1 - MARGIN), False),  # at the margin: the setting stays
        (10.0, 9.9, False),  # within the noise the margin allows for
        (10.0, 10.0, False),
        (2.0, 4.0, False),  # a fast link, where small chunks cost
    ],
)
def test_the_small_chunk_is_kept_only_past_the_margin(setting_time, small_time, small):
    assert small_is_faster(setting_time, small_time) is small
