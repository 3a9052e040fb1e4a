"""`InputEmbeds`: a step's input embeddings when its rows carry more than token ids.

Most steps feed token ids and let the model embed them (`prompt_embeds` returns
None after one check). Some requests bring more, and this object follows them:

- prompt embeddings used instead of the prompt tokens' (conditioned stages);
- conditioning rows added to the embeddings of the positions after the prompt,
  one per output, then a fill row (stream-conditioned talkers);
- the embeddings of the codes sampled with each output token (models with
  `num_token_codes`), added when that token is fed back;
- deepstack features added to the hidden states at a multimodal prompt's visual
  positions (`deepstack_rows`), dropped once the prompt is computed.
"""

from __future__ import annotations

import torch

from omnistage.models.base import CausalLM, DeepstackRows
from omnistage.worker.input_batch import InputBatch, RequestState
from omnistage.worker.step_inputs import StepInputs


class InputEmbeds:
    """The input embeddings and deepstack rows of one runner's steps."""

    def __init__(self, model: CausalLM, batch: InputBatch, device: torch.device) -> None:
        self.model = model
        self.batch = batch
        self.device = device
        self.own: set[str] = set()
        """Requests that bring input embeddings (prompt embeddings, conditioning rows)."""
        self.deepstack: set[str] = set()
        """Requests with deepstack features of prompt tokens not computed yet."""

    def track(self, state: RequestState) -> None:
        """Note a request the runner just took on (its embeddings and features, if any)."""
        if state.prompt_embeds is not None or state.conditioning is not None:
            self.own.add(state.req_id)
        mm = state.mm_decoder_inputs
        if mm is not None and mm.deepstack_embeds is not None:
            self.deepstack.add(state.req_id)

    def forget(self, req_id: str) -> None:
        self.own.discard(req_id)
        self.deepstack.discard(req_id)

    def prompt_embeds(self, inputs: StepInputs) -> torch.Tensor | None:
        """Input embeddings of the step when a scheduled request brings its own (prompt
        embeddings, conditioning rows) or the model embeds its tokens' codes, else None:
        the model embeds the token ids."""
        with_codes = self.model.num_token_codes > 0
        if not self.own and not with_codes:  # the common case: no row is touched
            return None
        embeds = self.model.embed_input_ids(inputs.input_ids)
        offset, fed_back = 0, _FedBackCodes()
        for row, n in zip(inputs.rows, inputs.row_counts, strict=True):
            state = self.batch.states[row]
            start, prompt_len = state.num_computed_tokens, len(state.prompt_token_ids)
            if state.prompt_embeds is not None:
                stop = min(start + n, prompt_len)
                if stop > start:
                    embeds[offset : offset + stop - start] = state.prompt_embeds[start:stop]
            # Positions past the prompt hold output tokens: output `first - prompt_len` first.
            first, last = max(start, prompt_len), start + n
            if first < last:
                at = offset + first - start
                self._add_conditioning(state, embeds[at : at + last - first], first - prompt_len)
                if with_codes:
                    codes = state.output_codes[first - prompt_len : last - prompt_len]
                    fed_back.add(at, codes)
                    if not self.model.codes_feed_back_by_row:
                        self._feed_back(embeds, fed_back)
                        fed_back = _FedBackCodes()
            offset += n
        self._feed_back(embeds, fed_back)
        return embeds

    def _add_conditioning(self, state: RequestState, out: torch.Tensor, first: int) -> None:
        """Add to the input embeddings `out` of outputs `first, first + 1, ...` their
        conditioning rows (then the fill row)."""
        if state.conditioning is not None:
            count = out.shape[0]
            rows = state.conditioning[first : first + count]
            out[: rows.shape[0]] += rows
            if state.conditioning_fill is not None and rows.shape[0] < count:
                out[rows.shape[0] :] += state.conditioning_fill

    def _feed_back(self, embeds: torch.Tensor, fed_back: _FedBackCodes) -> None:
        """Replace the embedding rows `fed_back` names by `feed_back_codes` of them and
        their codes: one call for all of them (the caller gives one request's rows at a
        time unless the model's `codes_feed_back_by_row`)."""
        if not fed_back.codes:
            return
        if self.model.token_codes_are_floats:  # float64 first: the rows as sampled
            codes = torch.tensor(fed_back.codes, dtype=torch.float64).to(
                embeds.device, embeds.dtype
            )
        else:
            codes = torch.tensor(fed_back.codes, dtype=torch.long, device=embeds.device)
        if len(fed_back.spans) == 1:  # one run of rows: a slice, no gather or scatter
            at, count = fed_back.spans[0]
            embeds[at : at + count] = self.model.feed_back_codes(embeds[at : at + count], codes)
            return
        rows = [i for at, count in fed_back.spans for i in range(at, at + count)]
        index = torch.tensor(rows, dtype=torch.long, device=embeds.device)
        embeds[index] = self.model.feed_back_codes(embeds[index], codes)

    def deepstack_rows(self, inputs: StepInputs) -> DeepstackRows | None:
        """The deepstack features of the step's prompt tokens at visual positions (a chunk
        `[s, e)` of a prompt takes the visual rows between the mask's counts before `s`
        and before `e`); None when no scheduled token has any. A request whose prompt is
        done leaves `deepstack` and drops its features (a recompute brings them again)."""
        spans, at = {}, 0
        for row, n in zip(inputs.rows, inputs.row_counts, strict=True):
            spans[row] = (at, n)
            at += n
        flat, feats, done = [], [], []
        for req_id in self.deepstack:
            row = self.batch.req_id_to_row[req_id]
            if row not in spans:
                continue  # not scheduled this step
            mm = self.batch.states[row].mm_decoder_inputs
            mask, (offset, n) = mm.visual_pos_mask, spans[row]
            start = self.batch.states[row].num_computed_tokens
            if start + n >= mask.shape[0]:
                done.append(req_id)
            local = mask[start : start + n].nonzero().flatten()
            if len(local):
                before = int(mask[:start].sum())
                flat.append(local + offset)
                feats.append(mm.deepstack_embeds[:, before : before + len(local)])
        for req_id in done:
            self.deepstack.discard(req_id)
            mm = self.batch.states[self.batch.req_id_to_row[req_id]].mm_decoder_inputs
            mm.visual_pos_mask = mm.deepstack_embeds = None
        if not flat:
            return None
        layers = max(f.shape[0] for f in feats)
        if any(f.shape[0] != layers for f in feats):  # requests may differ: pad with zeros
            feats = [torch.cat([f, f.new_zeros(layers - len(f), *f.shape[1:])]) for f in feats]
        return DeepstackRows(rows=torch.cat(flat).to(self.device), embeds=torch.cat(feats, dim=1))


class _FedBackCodes:
    """The fed-back outputs of a step whose codes are known: runs of embedding rows
    `(start, count)` and their codes, in the same order."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []
        self.codes: list = []

    def add(self, at: int, codes: list) -> None:
        if codes:
            self.spans.append((at, len(codes)))
            self.codes.extend(codes)
