"""The programs that run on the nodes, shipped whole to every node and started with
`python -m runner.node.<program>`: standard library, torch and transformers only, nothing of
the controller (no boto3, fabric, paramiko, rich). The controller may read their output types."""
