"""Devices: the mesh and sharding rules (`sharding`), the jit / pmap trainers (`trainers`), multi-host start-up (`distributed`)."""
