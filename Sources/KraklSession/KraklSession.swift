// One sharing session: the lifecycle (SharingLifecycle) and its wiring (SharingSession).
@_exported import KraklRoom
