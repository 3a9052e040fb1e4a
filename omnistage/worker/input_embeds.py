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
        the model embeds the token ids. A fed-back output's row is its token's embedding,
        plus its conditioning row, then made with its codes (`feed_back_codes`); the
        conditioning rows of the step are added in one operation and the codes fed back
        in one call (one per request unless the model's `codes_feed_back_by_row`)."""
        with_codes = self.model.num_token_codes > 0
        if not self.own and not with_codes:  # the common case: no row is touched
            return None
        embeds = self.model.embed_input_ids(inputs.input_ids)
        offset, added, fed_back = 0, _AddedRows(), _FedBackCodes()
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
                at, out = offset + first - start, first - prompt_len
                added.conditioning(state, at, out, last - first)
                if with_codes:
                    fed_back.add(at, state.output_codes[out : out + last - first])
            offset += n
        added.add_to(embeds)
        self._feed_back(embeds, fed_back)
        return embeds

    def _feed_back(self, embeds: torch.Tensor, fed_back: _FedBackCodes) -> None:
        """Replace the embedding rows `fed_back` names by `feed_back_codes` of them and
        their codes: one call for all of them if the model's `codes_feed_back_by_row`,
        else one per run of rows (a request's)."""
        if not fed_back.codes:
            return
        if self.model.token_codes_are_floats:  # float64 first: the rows as sampled
            codes = torch.tensor(fed_back.codes, dtype=torch.float64).to(
                embeds.device, embeds.dtype
            )
        else:
            codes = torch.tensor(fed_back.codes, dtype=torch.long, device=embeds.device)
        if not self.model.codes_feed_back_by_row or len(fed_back.spans) == 1:
            done = 0  # each run of rows alone: a slice, no gather or scatter
            for at, count in fed_back.spans:
                rows = embeds[at : at + count]
                embeds[at : at + count] = self.model.feed_back_codes(
                    rows, codes[done : done + count]
                )
                done += count
            return
        index = _index(fed_back.spans, embeds.device)
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


def _index(spans: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """The rows of the runs `(start, count)`, in order."""
    rows = [i for at, count in spans for i in range(at, at + count)]
    return torch.tensor(rows, dtype=torch.long, device=device)


class _AddedRows:
    """The conditioning rows of a step's outputs, added to their input embeddings in one
    operation (each row gets the same sum as its own `+=` would give)."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []
        self.rows: list[torch.Tensor] = []

    def conditioning(self, state: RequestState, at: int, first: int, count: int) -> None:
        """Outputs `first .. first + count - 1` of `state` at embedding rows `at ..`: their
        conditioning rows, then the fill row past them (none past them without one)."""
        if state.conditioning is None:
            return
        rows = state.conditioning[first : first + count]
        if rows.shape[0]:
            self.spans.append((at, rows.shape[0]))
            self.rows.append(rows)
        rest = count - rows.shape[0]
        if state.conditioning_fill is not None and rest > 0:
            self.spans.append((at + rows.shape[0], rest))
            self.rows.append(state.conditioning_fill.expand(rest, -1))

    def add_to(self, embeds: torch.Tensor) -> None:
        if not self.rows:
            return
        if len(self.spans) == 1:
            at, count = self.spans[0]
            embeds[at : at + count] += self.rows[0]
            return
        index = _index(self.spans, embeds.device)
        embeds[index] = embeds[index] + torch.cat(self.rows).to(embeds.device)


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
