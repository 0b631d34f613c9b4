from jaxmnist.cli import run

run()
