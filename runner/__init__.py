"""ftc's job side. train.py, glue.py, facts.py, allreduce_check.py and distenv.py run on
the nodes (plain scripts, stdlib + the stack); job.py, launch.py and bench.py run on the controller."""
