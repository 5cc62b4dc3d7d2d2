"""The inventory: regions, fabrics, switches, nodes, GPUs and offerings, and the services that keep them."""
