//! Byte-level BPE against Hugging Face `tokenizers` (an independent implementation).
//!
//! The fixture below was produced by `tokenizers` 0.23.3 (the script is at the end of this
//! file): a 468-token byte-level BPE trained on a small mixed corpus, and the ids that
//! library gives for each test string under the GPT-2 pre-tokenizer, the Llama 3 split
//! regex (with `ignore_merges`), the Qwen 2 split regex and llama.cpp's four-pass
//! `default` (as a sequence of splits). Our tokenizer, built from the same tokens and
//! merges with the matching `tokenizer.ggml.pre`, must give the same ids and decode them
//! back to the text.

use flint_loader::tokenizer::{PreTokenizer, StreamDecoder, Tokenizer, TokenizerConfig};

const FIXTURE: &str = r##"{"tokens": ["<|endoftext|>", "!", "\"", "#", "$", "%", "&", "'", "(", ")", "*", "+", ",", "-", ".", "/", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ":", ";", "<", "=", ">", "?", "@", "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S", "T", "U", "V", "W", "X", "Y", "Z", "[", "\\", "]", "^", "_", "`", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z", "{", "|", "}", "~", "¡", "¢", "£", "¤", "¥", "¦", "§", "¨", "©", "ª", "«", "¬", "®", "¯", "°", "±", "²", "³", "´", "µ", "¶", "·", "¸", "¹", "º", "»", "¼", "½", "¾", "¿", "À", "Á", "Â", "Ã", "Ä", "Å", "Æ", "Ç", "È", "É", "Ê", "Ë", "Ì", "Í", "Î", "Ï", "Ð", "Ñ", "Ò", "Ó", "Ô", "Õ", "Ö", "×", "Ø", "Ù", "Ú", "Û", "Ü", "Ý", "Þ", "ß", "à", "á", "â", "ã", "ä", "å", "æ", "ç", "è", "é", "ê", "ë", "ì", "í", "î", "ï", "ð", "ñ", "ò", "ó", "ô", "õ", "ö", "÷", "ø", "ù", "ú", "û", "ü", "ý", "þ", "ÿ", "Ā", "ā", "Ă", "ă", "Ą", "ą", "Ć", "ć", "Ĉ", "ĉ", "Ċ", "ċ", "Č", "č", "Ď", "ď", "Đ", "đ", "Ē", "ē", "Ĕ", "ĕ", "Ė", "ė", "Ę", "ę", "Ě", "ě", "Ĝ", "ĝ", "Ğ", "ğ", "Ġ", "ġ", "Ģ", "ģ", "Ĥ", "ĥ", "Ħ", "ħ", "Ĩ", "ĩ", "Ī", "ī", "Ĭ", "ĭ", "Į", "į", "İ", "ı", "Ĳ", "ĳ", "Ĵ", "ĵ", "Ķ", "ķ", "ĸ", "Ĺ", "ĺ", "Ļ", "ļ", "Ľ", "ľ", "Ŀ", "ŀ", "Ł", "ł", "Ń", "Ġ1", "he", "ll", "ĠĠ", "es", "in", "Ġs", "Ġw", "Ġ12", "an", "do", "pa", "um", "ve", "Ã©", "Ġf", "Ġl", "Ġt", "Ġan", "llo", "Ġ123", "Ġand", "'ll", "..", "He", "ces", "ox", "re", "ss", "»Î", "Ñģ", "čĊ", "Ġ2", "ĠI", "Ġc", "Ġdo", "ĠĠĠ", "ing", "Ġspa", "Ġwe", "Ġfox", "Ġthe", "Ġ1234", "Hello", "Ġspaces", "'d", "'m", "'s", "'t", "'ve", "'re", "):", "02", "14", "15", "42", "EL", "HEL", "LO", "Num", "The", "ad", "af", "ai", "az", "aÃ", "ass", "be", "br", "ck", "cl", "de", "ee", "en", "ead", "ick", "jum", "ld", "ling", "mm", "naÃ", "or", "ou", "ow", "ove", "omm", "ps", "qu", "rn", "rs", "rÃ©", "rai", "sum", "tu", "ws", "you", "¥æ", "ªŀ", "¬è", "¯ve", "·Î", "¸Ð", "¸Ń", "¹Î", "ºÎ", "ºÐ", "½Î", "Îķ", "Î»Î", "Ðł", "ÐºÐ", "Ñĥ", "ä¸Ń", "æĸ", "æĹ", "ðŁ", "ĊĊ", "ĊĠĠĠ", "Ġ#", "Ġ*", "Ġ-", "Ġ0", "Ġ3", "ĠA", "Ġx", "Ġhe", "Ġre", "ĠHello", "ĠHEL", "Ġbr", "Ġjum", "ĠnaÃ", "Ġove", "Ġqu", "ĠrÃ©", "Ġyou", "ĠÎķ", "ĠÐł", "Ġä¸Ń", "ĠæĹ", "ĠðŁ", "ĺĢ", "ľ¬è", "ines", "indo", "Ġshe", "Ġsee", "Ġwor", "Ġwindo", "pass", "Ġlaz", "Ġlead", "Ġlines", "Ġtrai", "...", "»Î·Î", "ÑģÑģ", "Ġ202", "ĠIt", "Ġcaf", "Ġcomm", "Ġdog", "Ġdon", "ĠĠĠčĊ", "Ġfoxes", "Ġthey", "Ġ12345", "1415", "Numbe", "class", "def", "ent", "own", "sumÃ©", "turn", "¥æľ¬è", "¸Ð¹", "¹ÎºÎ", "½Î¹ÎºÎ", "Î»Î»Î·Î", "ÐºÐ¸Ð¹", "ÑĥÑģÑģ", "æĸĩ", "Ġhello", "Ġreturn", "ĠHELLO", "Ġbrown", "Ġjumps", "ĠnaÃ¯ve", "Ġover", "Ġquick", "ĠrÃ©sumÃ©", "ĠÎķÎ»Î»Î·Î", "ĠÐłÑĥÑģÑģ", "Ġä¸Ńæĸĩ", "ĠæĹ¥æľ¬è", "ĠðŁĺĢ", "Ġworld", "Ġwindows", "Ġlazy", "Ġleading", "Ġtrailing", "Ġ2024", "ĠcafÃ©", "Ġcomment", "14159", "Numbers", "½Î¹ÎºÎ¬", "ĠÎķÎ»Î»Î·Î½Î¹ÎºÎ¬", "ĠÐłÑĥÑģÑģÐºÐ¸Ð¹", "ĠæĹ¥æľ¬èªŀ"], "merges": ["Ġ 1", "h e", "l l", "Ġ Ġ", "e s", "i n", "Ġ s", "Ġ w", "Ġ1 2", "a n", "d o", "p a", "u m", "v e", "Ã ©", "Ġ f", "Ġ l", "Ġ t", "Ġ an", "ll o", "Ġ12 3", "Ġan d", "' ll", ". .", "H e", "c es", "o x", "r e", "s s", "» Î", "Ñ ģ", "č Ċ", "Ġ 2", "Ġ I", "Ġ c", "Ġ do", "ĠĠ Ġ", "in g", "Ġs pa", "Ġw e", "Ġf ox", "Ġt he", "Ġ123 4", "He llo", "Ġspa ces", "' d", "' m", "' s", "' t", "' ve", "' re", ") :", "0 2", "1 4", "1 5", "4 2", "E L", "H EL", "L O", "N um", "T he", "a d", "a f", "a i", "a z", "a Ã", "a ss", "b e", "b r", "c k", "c l", "d e", "e e", "e n", "e ad", "i ck", "j um", "l d", "l ing", "m m", "n aÃ", "o r", "o u", "o w", "o ve", "o mm", "p s", "q u", "r n", "r s", "r Ã©", "r ai", "s um", "t u", "w s", "y ou", "¥ æ", "ª ŀ", "¬ è", "¯ ve", "· Î", "¸ Ð", "¸ Ń", "¹ Î", "º Î", "º Ð", "½ Î", "Î ķ", "Î »Î", "Ð ł", "Ð ºÐ", "Ñ ĥ", "ä ¸Ń", "æ ĸ", "æ Ĺ", "ð Ł", "Ċ Ċ", "Ċ ĠĠĠ", "Ġ #", "Ġ *", "Ġ -", "Ġ 0", "Ġ 3", "Ġ A", "Ġ x", "Ġ he", "Ġ re", "Ġ Hello", "Ġ HEL", "Ġ br", "Ġ jum", "Ġ naÃ", "Ġ ove", "Ġ qu", "Ġ rÃ©", "Ġ you", "Ġ Îķ", "Ġ Ðł", "Ġ ä¸Ń", "Ġ æĹ", "Ġ ðŁ", "ĺ Ģ", "ľ ¬è", "in es", "in do", "Ġs he", "Ġs ee", "Ġw or", "Ġw indo", "pa ss", "Ġl az", "Ġl ead", "Ġl ines", "Ġt rai", ".. .", "»Î ·Î", "Ñģ Ñģ", "Ġ2 02", "ĠI t", "Ġc af", "Ġc omm", "Ġdo g", "Ġdo n", "ĠĠĠ čĊ", "Ġfox es", "Ġthe y", "Ġ1234 5", "14 15", "Num be", "cl ass", "de f", "en t", "ow n", "sum Ã©", "tu rn", "¥æ ľ¬è", "¸Ð ¹", "¹Î ºÎ", "½Î ¹ÎºÎ", "Î»Î »Î·Î", "ÐºÐ ¸Ð¹", "Ñĥ ÑģÑģ", "æĸ ĩ", "Ġhe llo", "Ġre turn", "ĠHEL LO", "Ġbr own", "Ġjum ps", "ĠnaÃ ¯ve", "Ġove r", "Ġqu ick", "ĠrÃ© sumÃ©", "ĠÎķ Î»Î»Î·Î", "ĠÐł ÑĥÑģÑģ", "Ġä¸Ń æĸĩ", "ĠæĹ ¥æľ¬è", "ĠðŁ ĺĢ", "Ġwor ld", "Ġwindo ws", "Ġlaz y", "Ġlead ing", "Ġtrai ling", "Ġ202 4", "Ġcaf Ã©", "Ġcomm ent", "1415 9", "Numbe rs", "½Î¹ÎºÎ ¬", "ĠÎķÎ»Î»Î·Î ½Î¹ÎºÎ¬", "ĠÐłÑĥÑģÑģ ÐºÐ¸Ð¹", "ĠæĹ¥æľ¬è ªŀ"], "cases": {"gpt-2": [["Hello world", [300, 454]], ["The quick brown fox.", [317, 447, 443, 297, 14]], ["It's they're we'll I'M YOU'VE", [41, 84, 304, 422, 307, 296, 279, 290, 7, 45, 221, 57, 47, 53, 7, 54, 37]], ["  two leading", [221, 274, 87, 79, 457]], ["trailing   ", [84, 348, 335, 293]], ["multiple   inner    spaces", [77, 85, 76, 84, 73, 80, 76, 69, 260, 221, 262, 78, 69, 82, 293, 301]], ["tabs\tand\ttabs", [84, 65, 66, 83, 198, 266, 68, 198, 84, 65, 66, 83]], ["line one\nline two\n\n\nthree", [76, 262, 69, 221, 79, 78, 69, 199, 76, 262, 69, 274, 87, 79, 373, 199, 84, 72, 284, 69]], ["crlf\r\n\r\nx", [67, 82, 76, 70, 288, 202, 199, 88]], ["1 12 123 1234 12345 3.14159", [17, 265, 277, 299, 423, 379, 14, 462]], ["café naïve Ελληνικά Русский", [67, 319, 271, 445, 465, 466]], ["日本語のテキスト", [371, 432, 354, 160, 224, 107, 160, 226, 229, 160, 225, 256, 160, 225, 118, 160, 226, 231]], ["emoji 😀🚀 ok", [69, 77, 79, 74, 73, 453, 372, 249, 223, 221, 79, 75]], ["def f(x):\n    return x * 2", [427, 272, 8, 88, 308, 374, 441, 381, 376, 289]], ["!!! ??? ... ,,, $$$ +++ <=> ^^^ ~~~ |||", [1, 1, 1, 221, 31, 31, 31, 221, 411, 221, 12, 12, 12, 221, 4, 4, 4, 221, 11, 11, 11, 221, 28, 29, 30, 221, 62, 62, 62, 221, 94, 94, 94, 221, 92, 92, 92]], ["a", [65]], ["", []], [" ", [221]], ["\n", [199]], ["x  \n  y", [88, 260, 199, 221, 221, 89]], ["unseen ž ǅ ￦ characters", [85, 78, 83, 329, 78, 221, 130, 123, 221, 132, 228, 221, 172, 124, 100, 291, 72, 65, 82, 65, 67, 84, 69, 346]], ["quote's 'quoted' don't", [344, 79, 84, 69, 304, 221, 7, 344, 79, 84, 69, 68, 7, 419, 305]], ["a,b 1234567 x¿y «q» 12,345.67 $5+3=8 ^~|", [65, 12, 66, 423, 22, 23, 381, 127, 124, 89, 221, 127, 105, 81, 127, 120, 265, 12, 19, 20, 21, 14, 22, 23, 221, 4, 21, 11, 19, 29, 24, 221, 62, 94, 92]], ["¹²³ ٣٤٥ x²", [127, 118, 127, 111, 127, 112, 221, 150, 97, 150, 98, 150, 99, 381, 127, 111]]], "llama-bpe": [["Hello world", [300, 454]], ["The quick brown fox.", [317, 447, 443, 297, 14]], ["It's they're we'll I'M YOU'VE", [41, 84, 304, 422, 307, 296, 279, 290, 7, 45, 221, 57, 47, 53, 7, 54, 37]], ["  two leading", [221, 274, 87, 79, 457]], ["trailing   ", [84, 348, 335, 293]], ["multiple   inner    spaces", [77, 85, 76, 84, 73, 80, 76, 69, 260, 221, 262, 78, 69, 82, 293, 301]], ["tabs\tand\ttabs", [84, 65, 66, 83, 198, 266, 68, 198, 84, 65, 66, 83]], ["line one\nline two\n\n\nthree", [76, 262, 69, 221, 79, 78, 69, 199, 76, 262, 69, 274, 87, 79, 373, 199, 84, 72, 284, 69]], ["crlf\r\n\r\nx", [67, 82, 76, 70, 288, 288, 88]], ["1 12 123 1234 12345 3.14159", [17, 221, 17, 18, 221, 17, 18, 19, 221, 17, 18, 19, 20, 221, 17, 18, 19, 20, 21, 221, 19, 14, 310, 17, 21, 25]], ["café naïve Ελληνικά Русский", [67, 319, 271, 445, 465, 466]], ["日本語のテキスト", [371, 432, 354, 160, 224, 107, 160, 226, 229, 160, 225, 256, 160, 225, 118, 160, 226, 231]], ["emoji 😀🚀 ok", [69, 77, 79, 74, 73, 453, 372, 249, 223, 221, 79, 75]], ["def f(x):\n    return x * 2", [427, 272, 8, 88, 308, 199, 293, 441, 381, 376, 221, 18]], ["!!! ??? ... ,,, $$$ +++ <=> ^^^ ~~~ |||", [1, 1, 1, 221, 31, 31, 31, 221, 411, 221, 12, 12, 12, 221, 4, 4, 4, 221, 11, 11, 11, 221, 28, 29, 30, 221, 62, 62, 62, 221, 94, 94, 94, 221, 92, 92, 92]], ["a", [65]], ["", []], [" ", [221]], ["\n", [199]], ["x  \n  y", [88, 260, 199, 221, 221, 89]], ["unseen ž ǅ ￦ characters", [85, 78, 83, 329, 78, 221, 130, 123, 221, 132, 228, 221, 172, 124, 100, 291, 72, 65, 82, 65, 67, 84, 69, 346]], ["quote's 'quoted' don't", [344, 79, 84, 69, 304, 221, 7, 344, 79, 84, 69, 68, 7, 419, 305]], ["a,b 1234567 x¿y «q» 12,345.67 $5+3=8 ^~|", [65, 12, 66, 221, 17, 18, 19, 20, 21, 22, 23, 381, 127, 124, 89, 221, 127, 105, 81, 127, 120, 221, 17, 18, 12, 19, 20, 21, 14, 22, 23, 221, 4, 21, 11, 19, 29, 24, 221, 62, 94, 92]], ["¹²³ ٣٤٥ x²", [127, 118, 127, 111, 127, 112, 221, 150, 97, 150, 98, 150, 99, 381, 127, 111]]], "qwen2": [["Hello world", [300, 454]], ["The quick brown fox.", [317, 447, 443, 297, 14]], ["It's they're we'll I'M YOU'VE", [41, 84, 304, 422, 307, 296, 279, 290, 7, 45, 221, 57, 47, 53, 7, 54, 37]], ["  two leading", [221, 274, 87, 79, 457]], ["trailing   ", [84, 348, 335, 293]], ["multiple   inner    spaces", [77, 85, 76, 84, 73, 80, 76, 69, 260, 221, 262, 78, 69, 82, 293, 301]], ["tabs\tand\ttabs", [84, 65, 66, 83, 198, 266, 68, 198, 84, 65, 66, 83]], ["line one\nline two\n\n\nthree", [76, 262, 69, 221, 79, 78, 69, 199, 76, 262, 69, 274, 87, 79, 373, 199, 84, 72, 284, 69]], ["crlf\r\n\r\nx", [67, 82, 76, 70, 288, 288, 88]], ["1 12 123 1234 12345 3.14159", [17, 221, 17, 18, 221, 17, 18, 19, 221, 17, 18, 19, 20, 221, 17, 18, 19, 20, 21, 221, 19, 14, 17, 20, 17, 21, 25]], ["café naïve Ελληνικά Русский", [67, 319, 271, 445, 465, 466]], ["日本語のテキスト", [371, 432, 354, 160, 224, 107, 160, 226, 229, 160, 225, 256, 160, 225, 118, 160, 226, 231]], ["emoji 😀🚀 ok", [69, 77, 79, 74, 73, 453, 372, 249, 223, 221, 79, 75]], ["def f(x):\n    return x * 2", [427, 272, 8, 88, 308, 199, 293, 441, 381, 376, 221, 18]], ["!!! ??? ... ,,, $$$ +++ <=> ^^^ ~~~ |||", [1, 1, 1, 221, 31, 31, 31, 221, 411, 221, 12, 12, 12, 221, 4, 4, 4, 221, 11, 11, 11, 221, 28, 29, 30, 221, 62, 62, 62, 221, 94, 94, 94, 221, 92, 92, 92]], ["a", [65]], ["", []], [" ", [221]], ["\n", [199]], ["x  \n  y", [88, 260, 199, 221, 221, 89]], ["unseen ž ǅ ￦ characters", [85, 78, 83, 329, 78, 221, 130, 123, 221, 132, 228, 221, 172, 124, 100, 291, 72, 65, 82, 65, 67, 84, 69, 346]], ["quote's 'quoted' don't", [344, 79, 84, 69, 304, 221, 7, 344, 79, 84, 69, 68, 7, 419, 305]], ["a,b 1234567 x¿y «q» 12,345.67 $5+3=8 ^~|", [65, 12, 66, 221, 17, 18, 19, 20, 21, 22, 23, 381, 127, 124, 89, 221, 127, 105, 81, 127, 120, 221, 17, 18, 12, 19, 20, 21, 14, 22, 23, 221, 4, 21, 11, 19, 29, 24, 221, 62, 94, 92]], ["¹²³ ٣٤٥ x²", [127, 118, 127, 111, 127, 112, 221, 150, 97, 150, 98, 150, 99, 381, 127, 111]]], "default": [["Hello world", [300, 454]], ["The quick brown fox.", [317, 447, 443, 297, 14]], ["It's they're we'll I'M YOU'VE", [41, 84, 7, 83, 422, 7, 284, 296, 7, 259, 290, 7, 45, 221, 57, 47, 53, 7, 54, 37]], ["  two leading", [221, 274, 87, 79, 457]], ["trailing   ", [84, 348, 335, 293]], ["multiple   inner    spaces", [77, 85, 76, 84, 73, 80, 76, 69, 260, 221, 262, 78, 69, 82, 293, 301]], ["tabs\tand\ttabs", [84, 65, 66, 83, 198, 266, 68, 198, 84, 65, 66, 83]], ["line one\nline two\n\n\nthree", [76, 262, 69, 221, 79, 78, 69, 199, 76, 262, 69, 274, 87, 79, 373, 199, 84, 72, 284, 69]], ["crlf\r\n\r\nx", [67, 82, 76, 70, 288, 202, 199, 88]], ["1 12 123 1234 12345 3.14159", [17, 221, 17, 18, 221, 17, 18, 19, 221, 17, 18, 19, 20, 221, 17, 18, 19, 20, 21, 221, 19, 14, 310, 17, 21, 25]], ["café naïve Ελληνικά Русский", [67, 319, 271, 445, 465, 466]], ["日本語のテキスト", [371, 432, 354, 160, 224, 107, 160, 226, 229, 160, 225, 256, 160, 225, 118, 160, 226, 231]], ["emoji 😀🚀 ok", [69, 77, 79, 74, 73, 453, 372, 249, 223, 221, 79, 75]], ["def f(x):\n    return x * 2", [427, 272, 8, 88, 308, 374, 441, 381, 221, 10, 221, 18]], ["!!! ??? ... ,,, $$$ +++ <=> ^^^ ~~~ |||", [1, 1, 1, 221, 31, 31, 31, 221, 411, 221, 12, 12, 12, 221, 4, 4, 4, 221, 11, 11, 11, 221, 28, 29, 30, 221, 62, 62, 62, 221, 94, 94, 94, 221, 92, 92, 92]], ["a", [65]], ["", []], [" ", [221]], ["\n", [199]], ["x  \n  y", [88, 260, 199, 221, 221, 89]], ["unseen ž ǅ ￦ characters", [85, 78, 83, 329, 78, 221, 130, 123, 221, 132, 228, 221, 172, 124, 100, 291, 72, 65, 82, 65, 67, 84, 69, 346]], ["quote's 'quoted' don't", [344, 79, 84, 69, 7, 83, 221, 7, 344, 79, 84, 69, 68, 7, 419, 7, 84]], ["a,b 1234567 x¿y «q» 12,345.67 $5+3=8 ^~|", [65, 12, 66, 221, 17, 18, 19, 20, 21, 22, 23, 381, 127, 124, 89, 221, 127, 105, 81, 127, 120, 221, 17, 18, 12, 19, 20, 21, 14, 22, 23, 221, 4, 21, 11, 19, 29, 24, 221, 62, 94, 92]], ["¹²³ ٣٤٥ x²", [127, 118, 127, 111, 127, 112, 221, 150, 97, 150, 98, 150, 99, 381, 127, 111]]]}}"##;

fn fixture() -> serde_json::Value {
    serde_json::from_str(FIXTURE).expect("fixture json")
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

fn build(pre: PreTokenizer) -> Tokenizer {
    let fx = fixture();
    let cfg = TokenizerConfig::bpe(
        pre,
        strings(&fx["tokens"]),
        strings(&fx["merges"]),
        None,
        Some(0),
    );
    Tokenizer::from_config(&cfg).expect("bpe tokenizer")
}

fn check(name: &str, pre: PreTokenizer) {
    let tok = build(pre);
    let fx = fixture();
    let cases = fx["cases"][name].as_array().expect("cases");
    assert!(cases.len() > 20);
    let mut bad = Vec::new();
    for case in cases {
        let text = case[0].as_str().expect("text");
        let want: Vec<u32> = case[1]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        let got = tok.tokenize(text, false, false);
        if got != want {
            bad.push(format!("{text:?}: want {want:?} got {got:?}"));
        }
        // Byte-level BPE decodes losslessly, token by token.
        let bytes: Vec<u8> = got
            .iter()
            .flat_map(|&id| tok.token_to_piece(id, false).into_owned())
            .collect();
        assert_eq!(bytes, text.as_bytes(), "pieces of {text:?}");
        let mut dec = StreamDecoder::new();
        let mut s: String = got.iter().map(|&id| dec.push(&tok, id)).collect();
        s.push_str(&dec.finish());
        assert_eq!(s, text, "stream decode of {text:?}");
    }
    assert!(
        bad.is_empty(),
        "{name}: {} mismatches\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn bpe_gpt2_matches_hf_tokenizers() {
    check("gpt-2", PreTokenizer::Gpt2);
}

#[test]
fn bpe_llama3_matches_hf_tokenizers() {
    check("llama-bpe", PreTokenizer::Llama3);
}

#[test]
fn bpe_qwen2_matches_hf_tokenizers() {
    check("qwen2", PreTokenizer::Qwen2);
}

#[test]
fn bpe_default_matches_hf_tokenizers() {
    check("default", PreTokenizer::Default);
}

#[test]
fn bpe_special_and_metadata_round_trip() {
    let tok = build(PreTokenizer::Gpt2);
    assert_eq!(tok.eos(), Some(0));
    assert!(tok.is_eog(0));
    // Control text is matched only when parsing specials.
    let plain = tok.tokenize("a<|endoftext|>", false, false);
    assert!(!plain.contains(&0));
    assert_eq!(tok.tokenize("a<|endoftext|>", false, true).last(), Some(&0));
    // The metadata view names the keys a GGUF writer needs.
    let fx = fixture();
    let cfg = TokenizerConfig::bpe(
        PreTokenizer::Llama3,
        strings(&fx["tokens"]),
        strings(&fx["merges"]),
        None,
        Some(0),
    );
    let keys: Vec<String> = cfg.to_metadata().into_iter().map(|(k, _)| k).collect();
    for k in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.eos_token_id",
    ] {
        assert!(keys.iter().any(|x| x == k), "missing {k}");
    }
}

#[test]
fn bpe_errors_name_the_key() {
    let mut cfg = TokenizerConfig::bpe(PreTokenizer::Gpt2, vec!["a".into()], vec![], None, None);
    cfg.pre = Some("no-such-pre".into());
    let e = Tokenizer::from_config(&cfg)
        .expect_err("unknown pre")
        .to_string();
    assert!(
        e.contains("tokenizer.ggml.pre") && e.contains("no-such-pre"),
        "{e}"
    );
    cfg.pre = None;
    cfg.merges = None;
    let e = Tokenizer::from_config(&cfg)
        .expect_err("no merges")
        .to_string();
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    cfg.model = "t5".into();
    let e = Tokenizer::from_config(&cfg).expect_err("model").to_string();
    assert!(
        e.contains("tokenizer.ggml.model") && e.contains("t5"),
        "{e}"
    );
}

/* The generator (Python, `pip install tokenizers`):

import json
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders, Regex
corpus = [
 "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see 12345 foxes!",
 "Hello world! Hello, hello? HELLO... don't you've they're I'm she'd we'll",
 "def f(x):\n    return x * 2\n\n\nclass A:\n\tpass  # comment",
 "Numbers 0 1 12 123 1234 3.14159 -42 1e-9 and café naïve résumé Ελληνικά Русский 日本語 中文 😀",
 "   leading spaces and trailing spaces   \r\n windows lines\r\n",
] * 20
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tr = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"], show_progress=False)
tok.train_from_iterator(corpus, tr)
j = json.loads(tok.to_str())
vocab = j["model"]["vocab"]
merges = j["model"]["merges"]
merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
tokens = [None]*len(vocab)
for t,i in vocab.items(): tokens[i]=t
tests = [
 "Hello world", "The quick brown fox.", "It's they're we'll I'M YOU'VE", "  two leading", "trailing   ",
 "multiple   inner    spaces", "tabs\tand\ttabs", "line one\nline two\n\n\nthree", "crlf\r\n\r\nx",
 "1 12 123 1234 12345 3.14159", "café naïve Ελληνικά Русский", "日本語のテキスト", "emoji 😀🚀 ok",
 "def f(x):\n    return x * 2", "!!! ??? ... ,,, $$$ +++ <=> ^^^ ~~~ |||", "a", "", " ", "\n", "x  \n  y",
 "unseen ž ǅ ￦ characters", "quote's 'quoted' don't", "a,b 1234567 x¿y «q» 12,345.67 $5+3=8 ^~|", "¹²³ ٣٤٥ x²",
]
out = {"tokens": tokens, "merges": merges, "cases": {}}
def mk(pre, ignore_merges=False):
    t = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ",1)) for m in merges], ignore_merges=ignore_merges))
    t.pre_tokenizer = pre
    return t
L3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
Q2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
def split_then_bytes(rx):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
variants = {
 "gpt-2": mk(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)),
 "llama-bpe": mk(split_then_bytes(L3), ignore_merges=True),
 "qwen2": mk(split_then_bytes(Q2)),
 "default": mk(pre_tokenizers.Sequence([
     pre_tokenizers.Split(Regex(r"[\p{P}\$\+<=>\^~\|]+"), behavior="isolated"),
     pre_tokenizers.Split(Regex(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"), behavior="isolated"),
     pre_tokenizers.Split(Regex(r"\p{N}+"), behavior="isolated"),
     pre_tokenizers.Split(Regex(r"[0-9][0-9][0-9]"), behavior="isolated"),
     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),
}
for name, t in variants.items():
    t.add_special_tokens(["<|endoftext|>"])
    out["cases"][name] = [[s, t.encode(s, add_special_tokens=False).ids] for s in tests]
json.dump(out, open("/tmp/bpe/fixture.json","w"), ensure_ascii=False)
print(len(tokens), len(merges), len(json.dumps(out, ensure_ascii=False)))
print(out["cases"]["gpt-2"][:3])
*/
