"""
The node agent: a small Django-free program on the GPU hosts the operator controls (DESIGN.md,
Workers, the node agent and drivers). It holds no database or broker credentials: it speaks to
the control plane's node API over HTTP(S) with a per-node key, in a pull model -- heartbeats with
what NVML sees, then the commands waiting for it, then their results.

    python -m provisioning.agent --url https://meridian.example --key-id KEY --secret-file /etc/meridian/node.key
"""
