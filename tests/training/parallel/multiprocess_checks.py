"""One of two processes (launched by test_multiprocess.py) training 5 steps over a mesh that spans both.

    python multiprocess_checks.py PROCESS_ID NUM_PROCESSES PORT WORKDIR

Each process has 2 CPU devices; the (data 2, model 2) mesh puts one data shard on each process,
so each copies only its own rows of every batch. Process 0 writes `metrics.jsonl`; orbax writes
the checkpoint from both; each writes `params_PROCESS.npy`, its gathered unsharded copy.
"""

import sys
from pathlib import Path

import jax
import numpy as np

from models import Transformer
from sharding_checks import VOCAB, as_dict, make_batches, make_config, optimizer
from training import checkpoints, config as config_lib
from training.core.metrics import MetricsWriter
from training.parallel import distributed, trainers

STEPS = 5


def main(process_id, num_processes, port, workdir):
    jax.config.update("jax_num_cpu_devices", 2)
    config = make_config(4, 0.1, mesh=(2, 2))
    config.distributed.update(
        coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes, process_id=process_id
    )
    distributed.initialize(config.distributed)
    model = Transformer(config_lib.model_config(config, VOCAB))
    trainer = trainers.make_trainer(config, model, optimizer(config))
    batches = make_batches(STEPS)
    state = trainer.init_state(jax.random.key(0), batches[0])
    writer = MetricsWriter(workdir)
    for step, batch in enumerate(batches):
        state, metrics = trainer.step(state, trainer.put_batch(as_dict(batch)), jax.random.key(1))
        writer.write({"step": step + 1, "loss": float(metrics["loss"])})
    writer.close()
    ckpts = checkpoints.Checkpoints(workdir, 1)
    ckpts.save(STEPS, trainer.to_checkpoint(state))
    ckpts.close()
    params = jax.device_get(trainer.local_params(state.params))
    np.save(Path(workdir) / f"params_{process_id}.npy", np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)]))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
