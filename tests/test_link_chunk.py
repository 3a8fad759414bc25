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


def test_a_ring_cuts_small_segments_into_four_pieces_of_64_kib_or_more():
    from ringtrain.transport.messages import piece_elements

    mib = 1 << 18  # float32 elements of a 1 MiB chunk
    assert piece_elements(mib, 8 * mib, 4) == mib  # large segments keep the chunk
    assert piece_elements(mib, mib // 2, 4) == mib // 8  # 512 KiB: four of 128 KiB
    assert piece_elements(mib, mib // 2 + 1, 4) == mib // 8 + 1  # the last piece is shorter
    assert piece_elements(mib, 1000, 4) == 16384  # never under 64 KiB
    assert piece_elements(mib, 0, 4) == 16384
    assert piece_elements(mib, mib, 2) == 1 << 16  # 16-bit values: 128 KiB on the wire
    assert piece_elements(1024, mib, 4) == 1024  # a smaller chunk setting wins
