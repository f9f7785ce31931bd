"""The built-in spoken-digits task: records need both modalities, the split shares no
clip, espeak-ng's output is deterministic, and its absence is explained."""

import json
import shutil
import wave
import io

import numpy as np
import pytest

from megatron_mm.data import spoken_digits as sd


def test_records_pair_an_image_and_a_clip_with_their_sum():
    images = np.zeros((5, 8, 8), dtype=np.uint8)
    targets = np.array([7, 1, 2, 3, 4])
    clips = [(3, "audio/a.wav"), (9, "audio/b.wav")]
    lines = sd._pair_records("valid", 20, clips, images, targets, np.array([0]),
                             np.random.default_rng(0))
    recs = [json.loads(line) for line in lines]
    assert {r["spoken"] for r in recs} == {3, 9}
    for r in recs:
        assert r["conversations"][0]["value"].count("<image>") == 1 == len(r["images"])
        assert r["conversations"][0]["value"].count("<audio>") == 1 == len(r["audios"])
        want = {3: "seven plus three is ten", 9: "seven plus nine is sixteen"}[r["spoken"]]
        assert r["conversations"][1]["value"] == want


def test_missing_espeak_says_how_to_install(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(sd.EspeakMissingError, match="apt-get install -y espeak-ng"):
        sd.prepare_spoken_digits("unused-dir", force=True)


@pytest.mark.processes
@pytest.mark.skipif(shutil.which("espeak-ng") is None,
                    reason="espeak-ng not installed (make setup installs it)")
def test_espeak_clips_are_deterministic_16khz():
    binary = sd.espeak_binary()
    a = sd.speak("seven", "en-gb", 175, 50, binary)
    assert np.array_equal(a, sd.speak("seven", "en-gb", 175, 50, binary))
    assert 0.2 < len(a) / sd.SAMPLE_RATE < 1.5
    with wave.open(io.BytesIO(sd.wav_bytes(a))) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (16000, 2, 1)
    assert len(sd.clip_grid()) == 720
