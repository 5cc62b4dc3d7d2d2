"""The node agents seen from provisioning: the command queue drivers leave work in."""
