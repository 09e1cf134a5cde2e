"""Scale-out on Ray Serve (`embedserve serve-cluster`, extra `scale`): length pools as autoscaled
deployments behind an ingress that reuses the gateway's routing. Nothing here imports ray at
import time except replica.py, ingress.py and app.py, which only the Ray path loads."""
