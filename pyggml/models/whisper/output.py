"""A transcription as subtitles (SRT, WebVTT) or JSON."""
from __future__ import annotations

import json

from .transcribe import Transcription

__all__ = ["srt", "vtt", "to_json"]


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
