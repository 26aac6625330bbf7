#!/usr/bin/env bash
# Synthetic speech for tests/models/test_whisper.py (English; de/: German, for the multilingual model): espeak-ng (Debian's espeak-ng)
# speaks each sentence, sox resamples it to 16 kHz mono 16-bit WAV (espeak-ng writes 22,050 Hz).
#   apt-get install espeak-ng sox && bash tests/data/make_whisper_speech.sh
set -euo pipefail
out="$(dirname "$0")/whisper"
mkdir -p "$out" "$out/de"
say() {  # say NAME "TEXT"
    espeak-ng -v en-us -s 130 --stdout "$2" | sox -t wav - -r 16000 -c 1 -b 16 "$out/$1.wav"
}
say weather "The weather will be sunny tomorrow, with a light breeze from the west."
say numbers "Please call me back at five thirty, or send a message before noon."
espeak-ng -v de -s 130 --stdout "Das Wetter wird morgen sonnig, mit einer leichten Brise aus dem Westen." \
    | sox -t wav - -r 16000 -c 1 -b 16 "$out/de/wetter.wav"
