"""A transcription as subtitles (SRT, WebVTT), lyrics (LRC), plain text, tab-separated values or
JSON."""
from __future__ import annotations

import json

from .transcribe import Transcription

__all__ = ["srt", "vtt", "lrc", "txt", "tsv", "to_json"]


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(t: Transcription) -> str:
    """SubRip: numbered cues ``HH:MM:SS,mmm --> HH:MM:SS,mmm``."""
    return "".join(f"{i}\n{_stamp(s.start, ',')} --> {_stamp(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(t.segments, 1))


def vtt(t: Transcription) -> str:
    """WebVTT: a ``WEBVTT`` header, cues ``HH:MM:SS.mmm --> HH:MM:SS.mmm``."""
    return "WEBVTT\n\n" + "".join(f"{_stamp(s.start, '.')} --> {_stamp(s.end, '.')}\n{s.text.strip()}\n\n"
                                  for s in t.segments)


def to_json(t: Transcription) -> str:
    """The ``--dump`` object (:meth:`Transcription.as_dict`) as indented JSON."""
    return json.dumps(t.as_dict(), indent=1, ensure_ascii=False) + "\n"


def txt(t: Transcription) -> str:
    """Each segment's text on a line of its own."""
    return "".join(f"{s.text.strip()}\n" for s in t.segments)


def tsv(t: Transcription) -> str:
    """openai-whisper's TSV: a ``start	end	text`` header, then per segment its start and end in
    integer milliseconds and its text (tabs in it as spaces)."""
    return "start\tend\ttext\n" + "".join(
        f"{round(1000 * s.start)}\t{round(1000 * s.end)}\t{s.text.strip().replace(chr(9), ' ')}\n" for s in t.segments)


def _lrc_stamp(seconds: float) -> str:
    cs = int(round(seconds * 100))
    m, cs = divmod(cs, 6000)
    return f"{m:02d}:{cs // 100:02d}.{cs % 100:02d}"


def lrc(t: Transcription) -> str:
    """LRC lyrics: a ``[mm:ss.xx]`` line per segment; with word timestamps, enhanced LRC: each
    word after its own ``<mm:ss.xx>``."""
    lines = []
    for s in t.segments:
        if s.words:
            body = " ".join(f"<{_lrc_stamp(w.start)}> {w.word.strip()}" for w in s.words)
            lines.append(f"[{_lrc_stamp(s.start)}] {body} <{_lrc_stamp(s.end)}>\n")
        else:
            lines.append(f"[{_lrc_stamp(s.start)}] {s.text.strip()}\n")
    return "".join(lines)
