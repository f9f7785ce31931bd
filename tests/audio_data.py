"""A tiny image + audio dataset for training tests: handwritten digits and tones of
different lengths (no espeak-ng needed), with a yes/no question about both."""

from __future__ import annotations

import base64
import json
import os

import numpy as np

AUDIO_MODEL = [
    "--audio-model-type", "whisper", "--audio-hidden-size", "32", "--audio-num-layers", "2",
    "--audio-num-attention-heads", "2", "--audio-num-mel-bins", "16",
    "--audio-max-source-positions", "20", "--audio-pool-stride", "2",
]
MAX_SECONDS = 0.4  # 40 mel frames = 2 x --audio-max-source-positions


def write_audio_digits(out: str, n_train: int = 32, n_valid: int = 8) -> str:
    from megatron_mm.data.digits import load_digits_arrays, png_bytes
    from megatron_mm.data.spoken_digits import wav_bytes

    images, targets = load_digits_arrays()
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(out, "audio"), exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        lines = []
        for i in range(n):
            digit = int(targets[i])
            seconds = rng.uniform(0.1, MAX_SECONDS)  # clips of different lengths per batch
            t = np.arange(int(seconds * 16000)) / 16000
            tone = 0.3 * np.sin(2 * np.pi * (200 + 100 * digit) * t)
            rel = f"audio/{split}-{i}.wav"
            with open(os.path.join(out, rel), "wb") as f:
                f.write(wav_bytes(np.rint(tone * 32767).astype("<i2")))
            png = base64.b64encode(png_bytes(images[i])).decode("ascii")
            lines.append(json.dumps({
                "id": f"{split}-{i}",
                "conversations": [
                    {"from": "human", "value": "<image>\n<audio>\nSame digit?"},
                    {"from": "gpt", "value": "yes" if i % 2 else "no"}],
                "images": [{"data": "data:image/png;base64," + png}],
                "audios": [rel]}))
        with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return out
