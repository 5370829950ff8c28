fn main() {
    println!("urnic: CLI not built yet");
}
