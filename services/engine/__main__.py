from services.engine.server import main

main()
