"""The offload engine every method runs on: the target's experts in host memory behind an LRU cache of device slots
per MoE layer (`offload`, the engine; `layer`, one offloaded layer's forward; `cache`, the LRU; `copiers` and
`counters`), the copies over a real or modelled link (`link`), and, on a CPU-only machine, the emulated GPU whose
modelled forwards, copies and host work advance a virtual clock (`device`, with the paper's GPUs it is derived
from in `paper_gpus`). The MoE families it can offload are in `families`; copies ahead of a forward in `prefetch`;
other slot counts priced on the same forwards in `pricing`.
"""
