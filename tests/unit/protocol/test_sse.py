from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamlab_protocol.sse import Comment, Event, SSEDecoder, encode


def parse(*chunks: bytes) -> list[Event | Comment]:
    decoder = SSEDecoder()
    items: list[Event | Comment] = []
    for chunk in chunks:
        items.extend(decoder.feed(chunk))
    return items


def test_fields_comments_and_dispatch() -> None:
    stream = b": ping\n\nevent: token\nid: s1:1\nretry: 3000\ndata: a\ndata:b\n\ndata: [DONE]\n\n"
    assert parse(stream) == [
        Comment("ping"),
        Event(data="a\nb", event="token", id="s1:1", retry=3000),
        Event(data="[DONE]", id="s1:1"),  # the id persists across events
    ]


def test_every_line_ending_and_a_crlf_split_across_reads() -> None:
    assert parse(b"data: x\r\n\r\ndata: y\r\rdata: z\n\n") == [
        Event("x"), Event("y"), Event("z")]
    # CR at the end of one read, LF at the start of the next: one line end, not two.
    assert parse(b"data: x\r", b"\ndata: y\r\n\r\n") == [Event("x\ny")]


def test_bom_nul_id_bad_retry_and_events_without_data() -> None:
    items = parse(b"\xef\xbb\xbfid: ok\nretry: 1x\n\nid: bad\x00\ndata: d\n\n")
    assert items == [Event("d", id="ok")]


def test_multibyte_character_split_between_reads() -> None:
    raw = "data: naïve café 🚀\n\n".encode()
    for cut in range(len(raw)):
        assert parse(raw[:cut], raw[cut:]) == [Event("naïve café 🚀")]


_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n\x00"))
_events = st.builds(
    Event,
    data=st.lists(_text, min_size=1, max_size=3).map("\n".join),
    event=st.sampled_from(["message", "token", "done"]),
    id=st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n\x00"),
               min_size=1, max_size=12),
    retry=st.none() | st.integers(0, 10_000),
)


@given(events=st.lists(_events, max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_encode_then_parse_at_any_byte_boundaries_round_trips(
    events: list[Event], cuts: list[int]
) -> None:
    raw = b"".join(encode(e) for e in events)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert parse(*chunks) == events


def test_pending_chars_counts_an_event_not_yet_complete() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: " + b"x" * 1000)
    assert decoder.pending_chars == 1006  # the unfinished line
    decoder.feed(b"\ndata: yy\n")
    assert decoder.pending_chars == 1002  # two data lines, no blank line yet
    decoder.feed(b"\n")
    assert decoder.pending_chars == 0


def test_bytes_that_are_not_utf8_are_replaced_and_counted_a_split_character_is_not() -> None:
    decoder = SSEDecoder()
    items = decoder.feed(b"data: caf" + "é".encode()[:1])  # é split across reads
    items += decoder.feed("é".encode()[1:] + b"\n\n")
    assert items == [Event(data="café")]
    assert decoder.invalid_utf8 == 0
    items = decoder.feed(b"data: \xff\xfeok\n\n")
    assert items == [Event(data="\ufffd\ufffdok")]
    assert decoder.invalid_utf8 == 1
    assert decoder.feed("data: still é\n\n".encode()) == [Event(data="still é")]
    assert decoder.invalid_utf8 == 1
