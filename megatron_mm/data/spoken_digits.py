"""Built-in two-modality task: spoken digits (espeak-ng) paired with handwritten ones.

    python -m megatron_mm.data.spoken_digits --out DIR

Clips: the words "zero" ... "nine" spoken by espeak-ng in 8 English voices x 3 speeds x
3 pitches (720 clips, deterministic), resampled to 16 kHz WAV files under DIR/audio/.
One clip in six (a seed-0 permutation) is held out. Records pair a random handwritten digit
(sklearn's, split as in ``digits.py``, inline PNG) with a random clip and ask for their sum,
answered with the work shown: "seven plus three is ten" (the answer is right only if both
digits are; chance: 1 in 100). Train and validation share no clip and no image. Needs the
``espeak-ng`` program (Debian/Ubuntu: ``apt-get install -y espeak-ng``); re-running is a no-op
when the files already match.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
import wave

import numpy as np

from .digits import (WORDS, _sha256, _write_atomic, load_digits_arrays, manifest_matches,
                     png_bytes, split_indices)

SPOKEN_DIGITS_VERSION = 2
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan",
          "en-us+f3", "en-gb+f2")
SPEEDS = (140, 175, 210)  # words per minute
PITCHES = (30, 50, 70)
SAMPLE_RATE = 16000
NUM_TRAIN, NUM_VALID = 3000, 300
QUESTION = "<image>\n<audio>\nAdd the written and the spoken digit."
SUMS = WORDS + ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen")
MANIFEST = "spoken_digits_manifest.json"
INSTALL_HINT = ("the spoken-digits data needs the espeak-ng program: install it with "
                "`apt-get install -y espeak-ng` (Debian/Ubuntu) or `brew install espeak-ng` "
                "(macOS), or pass --data-path to your own data")


class EspeakMissingError(FileNotFoundError):
    """espeak-ng is not installed; the message says how to install it."""


def espeak_binary() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise EspeakMissingError(INSTALL_HINT)
    return path


def speak(word: str, voice: str, speed: int, pitch: int, binary: str) -> np.ndarray:
    """int16 samples at 16 kHz of espeak-ng saying ``word``."""
    from scipy.signal import resample_poly  # lazy: only when generating

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "clip.wav")
        subprocess.run([binary, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", out,
                        word], check=True, capture_output=True)
        with wave.open(out) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    x = pcm.astype(np.float64)
    g = np.gcd(rate, SAMPLE_RATE)
    y = resample_poly(x, SAMPLE_RATE // g, rate // g)
    return np.clip(np.rint(y), -32768, 32767).astype("<i2")


def wav_bytes(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def clip_grid() -> list[tuple[int, str, int, int]]:
    """(digit, voice, speed, pitch) of every clip, in a fixed order."""
    return [(d, v, s, p) for v in VOICES for s in SPEEDS for p in PITCHES for d in range(10)]


def answer(written: int, spoken: int) -> str:
    return f"{WORDS[written]} plus {WORDS[spoken]} is {SUMS[written + spoken]}"


def _pair_records(split: str, n: int, clips: list[tuple[int, str]], images: np.ndarray,
                  targets: np.ndarray, image_idx: np.ndarray, rng: np.random.Generator
                  ) -> list[str]:
    """``n`` records, each a random image and a random clip of the split."""
    lines = []
    for i in range(n):
        src = int(image_idx[rng.integers(len(image_idx))])
        written = int(targets[src])
        spoken, rel = clips[rng.integers(len(clips))]
        png = base64.b64encode(png_bytes(images[src])).decode("ascii")
        rec = {
            "id": f"spoken-digits-{split}-{i:05d}",
            "conversations": [{"from": "human", "value": QUESTION},
                              {"from": "gpt", "value": answer(written, spoken)}],
            "images": [{"data": "data:image/png;base64," + png}],
            "audios": [rel],
            "written": written, "spoken": spoken,  # extra fields are ignored by the reader
        }
        lines.append(json.dumps(rec, separators=(",", ":")))
    return lines


def build_files() -> dict[str, bytes]:
    """All output files (relative path -> content), built in memory."""
    binary = espeak_binary()
    files: dict[str, bytes] = {}
    clips = []
    for digit, voice, speed, pitch in clip_grid():
        rel = f"audio/{voice.replace('+', '_')}-s{speed}-p{pitch}-{digit}.wav"
        files[rel] = wav_bytes(speak(WORDS[digit], voice, speed, pitch, binary))
        clips.append((digit, rel))
    order = np.random.default_rng(0).permutation(len(clips))
    n_valid = len(clips) // 6
    split_clips = {"valid": [clips[i] for i in order[:n_valid]],
                   "train": [clips[i] for i in order[n_valid:]]}
    images, targets = load_digits_arrays()
    rng = np.random.default_rng(1)
    for split, idx, n in zip(("train", "valid"), split_indices(), (NUM_TRAIN, NUM_VALID)):
        lines = _pair_records(split, n, split_clips[split], images, targets, idx, rng)
        files[f"{split}.jsonl"] = ("\n".join(lines) + "\n").encode("utf-8")
    return files


def _up_to_date(out_dir: str) -> bool:
    return manifest_matches(out_dir, {"version": SPOKEN_DIGITS_VERSION})


def prepare_spoken_digits(out_dir: str | os.PathLike, force: bool = False) -> tuple[str, str]:
    """Write the spoken-digits task into `out_dir` (idempotent); (train_path, valid_path)."""
    out_dir = os.fspath(out_dir)
    train, valid = os.path.join(out_dir, "train.jsonl"), os.path.join(out_dir, "valid.jsonl")
    if not force and _up_to_date(out_dir):
        return train, valid
    files = build_files()
    for rel, data in files.items():
        _write_atomic(os.path.join(out_dir, rel), data)
    manifest = {"version": SPOKEN_DIGITS_VERSION,
                "sha256": {rel: _sha256(data) for rel, data in files.items()}}
    _write_atomic(os.path.join(out_dir, MANIFEST), json.dumps(manifest, indent=1).encode())
    return train, valid


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--force", action="store_true", help="rewrite even if up to date")
    args = p.parse_args(argv)
    try:
        train, valid = prepare_spoken_digits(args.out, force=args.force)
    except EspeakMissingError as e:
        raise SystemExit(f"error: {e}")
    print(f"train: {train}\nvalid: {valid}")


if __name__ == "__main__":
    main()
