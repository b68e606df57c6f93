"""The stage machinery: a stock model cut into pipeline stages and run apart.

- `cut`: a stage of the stock model (`StageModule`: the model's own forward, other stages' layers stood in, the
  received activations injected), and `probe`, which learns how the layers are called;
- `hold`: what a process keeps of a model whose stages run on separate processes;
- `engine`: `PipelineEngine`, the training schedules over processes (`torch.distributed.pipelining`);
- `forward`: forward-only runs through the stages (evaluation, `pipeline()`, `generate()`), micro-batches in flight;
- `checkpoint`, `optimizer`: a stage's part of a checkpoint (weights, optimizer state), written and read per stage;
- `balance`: each stage's measured time, for `optimum-ipu config balance`.
"""
