"""Running a multimodal model's own encoders at prefill: media in, feature vectors out.

The processor turns a decoded image or clip into the encoder's input (PIL resizing and
normalization, Whisper log-mel features); the model's vision tower + projector or audio
encoder + projector turn that into one feature vector per placeholder token, which the engine
feeds through `inputs_embeds` in the placeholders' place (`embeddings`: a step's input
embeddings, each prompt piece taking the slice of features it covers). Only the architectures
of inference/media_layout.py are supported.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.masking_utils import create_bidirectional_mask

from .sequence import Work
from .types import MediaInput


class MediaMismatch(Exception):
    """The encoder yields a different number of features than the prompt has placeholders."""


class MediaEncoder:
    def __init__(self, model: Any, processor: Any) -> None:
        self.model = model
        self.processor = processor
        embeddings = model.get_input_embeddings().weight
        self._device, self._dtype = embeddings.device, embeddings.dtype

    @property
    def modalities(self) -> frozenset[str]:
        found = set()
        if getattr(self.processor, "image_processor", None) is not None and hasattr(
            self.model, "get_image_features"
        ):
            found.add("image")
        if getattr(self.processor, "feature_extractor", None) is not None and hasattr(
            getattr(self.model, "model", None), "audio_tower"
        ):
            found.add("audio")
        return frozenset(found)

    def encode(self, media: MediaInput) -> torch.Tensor:
        """`[media.length, hidden]` features for the placeholders of `media`."""
        if media.modality == "image":
            features = self._image(media.value)
        elif media.modality == "audio":
            features = self._audio(media.value)
        else:
            raise ValueError(f"unknown modality {media.modality!r}")
        if features.shape[0] != media.length:
            raise MediaMismatch(f"{features.shape[0]} features for {media.length} placeholders")
        return features.to(self._dtype)

    def embeddings(self, ids: torch.Tensor, work: Work, *, packed: bool) -> torch.Tensor | None:
        """Input embeddings of a step's `ids` (the model runner's, runner.py) with the
        placeholders of its media replaced by their features; None when no scheduled piece
        covers a placeholder (text stays on input_ids).

        A prompt split across steps takes the slice of each media's features its piece covers;
        a media's features are computed once per request, when a piece first needs them.
        """
        pieces: list[tuple[int, int, torch.Tensor]] = []
        offset = 0
        for row, (seq, take) in enumerate(work):
            lo, hi = seq.computed, seq.computed + take
            for index, media in enumerate(seq.owner.spec.media):
                a, b = max(lo, media.start), min(hi, media.start + media.length)
                if a >= b:
                    continue
                features = seq.owner.features.get(index)
                if features is None:
                    features = seq.owner.features[index] = self.encode(media)
                at = (0, offset + a - lo) if packed else (row, 0)
                pieces.append((*at, features[a - media.start : b - media.start]))
            offset += take
        if not pieces:
            return None
        embeds = self.model.get_input_embeddings()(ids)
        for row, col, features in pieces:
            embeds[row, col : col + features.shape[0]] = features.to(embeds.device, embeds.dtype)
        return embeds

    def _image(self, image: Any) -> torch.Tensor:
        pixels = self.processor.image_processor(images=[image], return_tensors="pt")
        values = pixels["pixel_values"].to(self._device, self._dtype)
        out = self.model.get_image_features(pixel_values=values, return_dict=True)
        return out.pooler_output[0]

    def _audio(self, samples: Any) -> torch.Tensor:
        # What Qwen2AudioModel.forward does for its audio, for one clip and no padding rows.
        extractor = self.processor.feature_extractor
        inputs = extractor(
            samples,
            sampling_rate=extractor.sampling_rate,
            return_attention_mask=True,
            padding="max_length",
            return_tensors="pt",
        )
        core = self.model.model
        tower = core.audio_tower
        features = inputs["input_features"].to(self._device, self._dtype)
        frames = inputs["attention_mask"].to(self._device).sum(-1)
        lengths, output_lengths = tower._get_feat_extract_output_lengths(frames)
        positions = (features.shape[-1] - 2) // 2 + 1
        valid = torch.arange(positions, device=self._device)[None, :] < lengths[:, None]
        mask = create_bidirectional_mask(
            config=tower.config,
            inputs_embeds=torch.zeros((1, positions, 1), dtype=self._dtype, device=self._device),
            attention_mask=valid.long(),
        )
        hidden = tower(features, attention_mask=mask).last_hidden_state
        projected = core.multi_modal_projector(hidden)
        return projected[0, : int(output_lengths[0])]
