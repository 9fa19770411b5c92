"""The node agent: sources → adaptive sampler → Kafka publisher. Stays light:
standard library, contracts, nvidia-ml-py and kafka-python only."""
