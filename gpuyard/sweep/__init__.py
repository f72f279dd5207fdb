"""Sweeps: many simulations described by one TOML file, run on one NATS server or many machines.

`config`: the file (typed, validated) and its plan, one `Run` per combination, each identified by
a hash of its inputs. `queue`: the work queue on the NATS server (JetStream streams and an object
store) that carries runs to workers and results back. `worker`: `gpuyard worker`, which takes runs
from the queue and simulates them in its own process. `engine`: `gpuyard sweep`, which publishes the
runs, starts local workers (unless they run elsewhere), gathers the results and writes the results
table. `report`: `gpuyard report`, figures and one self-contained HTML page.
"""
