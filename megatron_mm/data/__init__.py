"""Data layer: JSONL records, tokenizer, media preprocessing, samples, sampler.

Exports are resolved lazily so `python -m megatron_mm.data.digits` neither
imports torch nor triggers runpy's "found in sys.modules" warning.
"""
import importlib

_EXPORTS = {
    "DataRecordError": "records", "MODALITIES": "records", "ModalitySpec": "records",
    "Record": "records", "read_records": "records",
    "MultimodalTokenizer": "tokenizer", "build_tokenizer": "tokenizer",
    "ImageProcessorConfig": "media", "load_image": "media", "preprocess_image": "media",
    "Sample": "processing", "collate": "processing", "encode_record": "processing",
    "MultimodalDataset": "dataset", "MegatronPretrainingSampler": "dataset",
    "prepare_digits": "digits",
    "collate_packed": "packing",
    "JsonlRecords": "jsonl_index", "BlendedDataset": "blend",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
