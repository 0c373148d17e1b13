"""The three services (gateway, scheduler, gpu_worker), and beside them the two things that
compose them: the command line and the in-process engine."""
