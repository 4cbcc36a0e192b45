"""Devices: the jit / pmap trainers (`trainers`), the mesh and sharding rules (`sharding`), multi-host start-up
(`distributed`)."""
