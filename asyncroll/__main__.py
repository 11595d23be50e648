from asyncroll.cli import main

main()
