"""Local operations: the local Kafka and Redis stack (`vigil up`), and the topics
every process makes sure of before it starts."""
