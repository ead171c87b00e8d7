"""Elastic training with hvd.torch (Horovod's elastic API): a small MLP
regression on synthetic, deterministic data.

    hvdrun -np 2 python3 examples/pytorch_elastic.py
    hvdrun -np 3 --min-np 2 --max-np 3 python3 examples/pytorch_elastic.py

In an elastic job a worker may die: the others restore the last commit,
re-form the job and go on from there; the ElasticSampler hands the samples
of the epoch not yet processed to the ranks there are now. Rank 0 prints
"epoch E loss L" after each epoch and "final loss L" at the end.
"""

import argparse
import time

import torch

import hvd.torch as hvd


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    y = torch.tanh(x @ w / 2.0) + 0.05 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--batches-per-commit", type=int, default=4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--batch-sleep", type=float, default=0.0,
                   help="seconds to sleep after each batch (to give a "
                        "test time to kill a worker)")
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    dataset = make_data(args.samples, args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1))
    base_lr = args.lr
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size(),
                                momentum=0.9)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True,
                                         seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset,
                                         batch_size=args.batch_size,
                                         sampler=sampler)

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer,
                                   sampler=sampler, epoch=0, batch=0)

    def on_reset():
        # The learning rate follows the number of ranks.
        for group in optimizer.param_groups:
            group["lr"] = base_lr * hvd.size()
        if hvd.rank() == 0:
            print("reset: %d ranks (generation %d)" %
                  (hvd.size(), hvd.elastic.generation()), flush=True)

    state.register_reset_callbacks([on_reset])

    def loss_on_all():
        with torch.no_grad():
            x, y = dataset.tensors
            local = torch.nn.functional.mse_loss(model(x), y)
        return float(hvd.allreduce(local, name="eval_loss"))

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            for state.batch, (x, y) in enumerate(loader, state.batch):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(state.batch, args.batch_size)
                if (state.batch + 1) % args.batches_per_commit == 0:
                    state.commit()
                if args.batch_sleep:
                    time.sleep(args.batch_sleep)
            epoch_loss = loss_on_all()
            if hvd.rank() == 0:
                print("epoch %d loss %.6f" % (state.epoch, epoch_loss),
                      flush=True)
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()
        return loss_on_all()

    final = train(state)
    if hvd.rank() == 0:
        print("final loss %.6f" % final, flush=True)


if __name__ == "__main__":
    main()
